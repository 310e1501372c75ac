from dagtrain.cli import main

# guarded: the LocalExecutor's worker processes re-import the main module
if __name__ == "__main__":
    main()
