from exo.main import main

main()
