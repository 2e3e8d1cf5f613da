from raymt.cli import main

main()
