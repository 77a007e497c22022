import servescope


def test_public_namespace_is_exactly_what_we_document():
    assert sorted(servescope.__all__) == sorted(
        [
            "CANONICAL_STAGES",
            "ConfigError",
            "CudaEventClock",
            "Distribution",
            "EndpointError",
            "Finding",
            "InvalidPayload",
            "MissingDependencyError",
            "Model",
            "Recorder",
            "RecordError",
            "Report",
            "ReportError",
            "SchemaError",
            "ServerTimingError",
            "ServescopeError",
            "StageError",
            "SyncClock",
            "Trace",
            "WallClock",
            "__version__",
            "current_trace",
            "format_server_timing",
            "parse_server_timing",
            "serve",
            "stage",
            "trace",
        ]
    )
    for name in servescope.__all__:
        assert hasattr(servescope, name), name


def test_every_error_is_a_servescope_error():
    for name in servescope.__all__:
        obj = getattr(servescope, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, servescope.ServescopeError)
