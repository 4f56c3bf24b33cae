"""Talking to a host: the only SSH code (transport.py: paramiko, streams read to their end; duplex.py:
two-way commands; hostkeys.py), the driver's one retry policy (retry.py), the session that runs
enlace/remote/remote.sh verbs and reads their one JSON answer (session.py), and the guarded OS calls for helper
processes (portable.py). May import: hosts, errors, sshlib, enlace's sysinfo."""
