"""This process and its controls: where it runs (``runtime``: rank, world, device, process
group), the requests it takes by signal (``run_requests``), its life tied to its parent's
(``lifeline``) and its allocator's settings (``allocator``)."""
