"""Which host a name means: hosts files, ~/.ssh/config through `ssh -G`, `local`, ProxyJump
(resolve.py), and the hosts file's typed schema (schema.py). May import: errors, sshlib (paramiko's ssh
config reader), enlace's names, yamlio and Slurm settings; never ssh/ (which imports this)."""
