from bench.cli import main

if __name__ == "__main__":  # not when a spawned worker (bench.scale_seed) re-imports the main module
    raise SystemExit(main())
