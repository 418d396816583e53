"""Launching the trainer: as Kubeflow jobs on a cluster, or as local processes.

``manifests`` renders a PyTorchJob or TrainJob from a ``JobSpec``; ``kinds``
knows how to read each kind back; ``kube`` talks to the API server; ``follow``
watches a job and streams its replicas' logs to the end; ``local`` runs the same
trainer with torchrun on this machine. ``components.train_model`` ties them to
the pipeline.
"""
