from dagtrain.cli import main

main()
