"""The REDSYN HTTP door (seed 003): node tokens, the /redsyn/v1 endpoints."""
