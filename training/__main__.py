# Guarded: Hogwild's processes are started with the spawn method, which imports the parent's main
# module (this one) in each child; unguarded, every one would start a run of its own.
if __name__ == "__main__":
    import logging
    import os
    import sys

    from training.cli import main

    code = main()
    # main's finally blocks did a run's own cleanup (shared memory unlinked, process group
    # destroyed, children joined, events written line by line). What the interpreter's teardown
    # does after that, with torch loaded (torchvision, dynamo where used), is free memory the
    # exit frees anyway, at 0.6-1.7 s of CPU a process (measured): a run's every process pays it
    # at its end, the dashboard waits for it, and so did every test. An exception (a refusal,
    # SIGTERM) still takes the interpreter's way out.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
