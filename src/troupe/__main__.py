from troupe.cli import main

raise SystemExit(main())
