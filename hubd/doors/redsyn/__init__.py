"""The REDSYN HTTP door (seed 003): node tokens (nodes.py); the /redsyn/v1
endpoints follow (docs/redsyn.md, "Status")."""
