"""The data a run trains on: what a dataset is in memory (``datasets``), where each comes from
(``idx_files`` for MNIST and Fashion-MNIST, ``external`` for torchvision's and plug-ins,
``images`` for image folders, ``downloads``), which path it takes (``sources``: resident or
streaming), the one copy in shared memory (``shared_data``), and which images make up each batch
(``batching``, ``streaming``)."""
