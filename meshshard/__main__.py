from meshshard.cli import main

raise SystemExit(main())
