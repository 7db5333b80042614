from aggregator.launch import main

raise SystemExit(main())
