"""Bytes between here and a host: git sync (gitsync.py), fetch of checkpoints, exports and run files
(fetch.py), data push (datapush.py), and what fetch and push share on their one channel (wire.py). May import:
ssh, errors, and enlace's contract, errors, hashing, config schema and data paths."""
