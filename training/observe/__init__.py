"""What a rank measures and reports of itself: where its time goes (``phases``: the clock;
``collectives``: the communication phase and its bytes; ``meter``: the windows the events
report), what it holds (``memory``), profiles on request (``profiling``, ``trace_summary``), and
the events every strategy writes the same way (``reporting``)."""
