from podrunner.runner import main

raise SystemExit(main())
