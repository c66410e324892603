from vllm_selfspec.offline.build_datastore import main

if __name__ == "__main__":
    main()
