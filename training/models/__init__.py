"""The networks a run trains: the built-in ``simple_cnn`` and ``build``, which makes any model of
the catalogue (``training.catalogue``) fit a dataset."""
