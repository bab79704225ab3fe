from speclock.cli import main

raise SystemExit(main())
