from vllm_selfspec.offline.results_table import main

if __name__ == "__main__":
    main()
