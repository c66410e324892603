from vllm_selfspec.offline.gate_plot import main

if __name__ == "__main__":
    main()
