from infertool.cli import main

main()
