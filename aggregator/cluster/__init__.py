"""Several replicas of one deployment sharing a Redis (`server.cluster`): change events, poll leases, interests and a
shared content cache. Nothing here is used when `server.cluster` is not set."""
