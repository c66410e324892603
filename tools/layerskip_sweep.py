from vllm_selfspec.offline.layerskip_sweep import main

if __name__ == "__main__":
    main()
