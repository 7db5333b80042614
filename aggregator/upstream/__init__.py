"""A client of other MCP servers ("upstreams"), the foundation of the `mcp` source kind.

`Upstream` keeps one connection to one upstream alive (stdio child or Streamable HTTP, either wire) and offers
listing, reading, completion and change events with timeouts, a concurrency cap and reconnection;
`aggregator.sources.mcp.McpSource` adapts it to the `Source` interface.
"""

from aggregator.upstream.connection import (ListChanged, Listing, Updated, Upstream, UpstreamContent, UpstreamEvent,
                                            UpstreamRead, UpstreamStatus)
from aggregator.upstream.transports import HttpTarget, StdioTarget, Target

__all__ = ["HttpTarget", "ListChanged", "Listing", "StdioTarget", "Target", "Updated", "Upstream", "UpstreamContent",
           "UpstreamEvent", "UpstreamRead", "UpstreamStatus"]
