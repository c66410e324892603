from vllm_selfspec.offline.tp_check import main

if __name__ == "__main__":
    main()
