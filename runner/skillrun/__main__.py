from skillrun.cli import main

main()
