"""``python -m mmtf.retrieve``: see :mod:`mmtf.retrieve`."""

from mmtf.retrieve import main

main()
