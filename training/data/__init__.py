"""The data a run trains on: where each dataset comes from (``datasets``, ``external``,
``images``, ``downloads``), which path it takes (``sources``: resident or streaming), the one copy
in shared memory (``shared_data``), and which images make up each batch (``batching``,
``streaming``)."""
