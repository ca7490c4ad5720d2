"""Doors: each turns one wire protocol into the core's commands and frames
the core's messages for its wire. The WebSocket door is the first."""
