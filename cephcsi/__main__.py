from cephcsi.cli.main import main

raise SystemExit(main())
