from specdeploy_localcluster.podrunner.runner import main

raise SystemExit(main())
