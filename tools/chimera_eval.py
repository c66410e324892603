from vllm_selfspec.offline.chimera_eval import main

if __name__ == "__main__":
    main()
