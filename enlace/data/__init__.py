"""The data a run reads: where its files are (paths.py, standard library only, used by the driver too), the
byte stream and token shards, each with its whole position as state (bytestream.py, shards.py), and the
stream a run opens (streams.py), drawn ahead on a helper thread (prefetch.py); random bytes of a run's shape
for preflight (synthetic.py). May import: the contract, errors, config; torch and numpy in the streams."""
