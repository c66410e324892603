from vllm_selfspec.offline.ngrammys_calls import main

if __name__ == "__main__":
    main()
