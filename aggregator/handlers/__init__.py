"""The MCP request handlers, one module per group of methods: `resources` (list, templates, read, completion),
`subscriptions` (legacy subscribe, modern listen), `tools` (the tool fallback), all run through `running`, which
turns their failures into the MCP error the caller's wire expects. server.py wires them into the SDK's Server.
"""
