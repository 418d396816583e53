"""Launching the trainer: as Kubeflow jobs on a cluster, or as local processes.

``manifests`` renders a PyTorchJob or TrainJob from a ``JobSpec``; ``kinds``
knows how to read each kind back; ``kube`` talks to the API server; ``follow``
runs a job to its end, with ``logs`` streaming every replica's log; ``local``
runs the same trainer with torchrun on this machine; ``reports`` and
``signals`` hold what both share (failure reports, SIGTERM handling).
``components.train.stage`` ties them to the pipeline.
"""
