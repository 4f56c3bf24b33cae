"""Talking to a host: the only SSH code (transport.py: paramiko, retries, streams; duplex.py: two-way
commands; hostkeys.py, sshlib.py), the session that runs scripts/remote.sh verbs and reads their one JSON
answer (session.py), and the guarded OS calls for helper processes (portable.py). May import: hosts,
errors, the contract."""
