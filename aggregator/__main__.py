from aggregator.startup import pause_collection

pause_collection()  # from here, not main(): the CLI's own imports are start-up too (main resumes the collector)

from aggregator.cli import main  # noqa: E402

raise SystemExit(main())
