from netreduce.cli import main

main()
