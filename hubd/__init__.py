"""hubd: a coordination hub and federation gateway for fleets of AI agents."""

__version__ = "0.1.0"
