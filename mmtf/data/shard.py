"""``python -m mmtf.data.shard`` (and ``mmtf-data-shard``): :func:`mmtf.data.shards.writer.main`."""

from mmtf.data.shards.writer import main

if __name__ == "__main__":
    main()
