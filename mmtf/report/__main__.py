"""`python -m mmtf.report run_dir=...`: see :mod:`mmtf.report.cli`."""

from mmtf.report.cli import main

if __name__ == "__main__":
    main()
