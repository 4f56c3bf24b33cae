from enlace.cli import main

main()
