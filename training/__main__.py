# Guarded: Hogwild's processes are started with the spawn method, which imports the parent's main
# module (this one) in each child; unguarded, every one would start a run of its own.
if __name__ == "__main__":
    from training.cli import main

    raise SystemExit(main())
