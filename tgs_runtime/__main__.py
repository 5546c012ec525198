from tgs_runtime.cli import main

main()
