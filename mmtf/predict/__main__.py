"""``python -m mmtf.predict``: see :mod:`mmtf.predict`."""

from mmtf.predict import main

main()
