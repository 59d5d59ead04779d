from trtspec.cli.main import main

main()
