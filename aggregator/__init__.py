"""aggregator: a YAML manifest becomes an MCP resources server."""

__version__ = "0.1.0"
