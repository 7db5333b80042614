"""The operator's web console (`server.console`, served by `serve --http` at /console): see aggregator.console.app.

Importing the package costs nothing: the supervisor imports only `history` from it."""
