"""The local-cluster harness: a real Kubernetes control plane with simulated GPU node pools on this machine,
and what the tests and benchmarks run against it.

- cluster.py: `LocalCluster`, one cluster and its directory; startup.py starts and stops its processes
  (components.py), controlplane.py, autoscalingstack.py and metricsstack.py say how, pki.py issues its
  certificates, nodepools.py shapes its nodes, adminapi.py reaches its API; cli.py is its command line;
- the node agents it runs: provisioner.py (volumes) and podrunner/ (the pods that run for real), on the pod
  network of podnet.py;
- for tests and benchmarks: operatorproc.py (the operator as a child process), serviceload.py (load through a
  Service), demomodels.py (the demo's models made in the cluster), netguard.py (the loopback-only guard);
- processes.py: pids, process groups and ports (the standard library only, as is everything `down` and
  `status` import).

Nothing here imports the rest of the repository (benchmarks, tests, hack's scripts): they import this.
"""
