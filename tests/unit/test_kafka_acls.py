"""The secure broker's policy as data (``podcost_localinfra.kafka_secure``): the layout's names
are the services' defaults, only the writers may create topics, and the ``AclCommand`` calls
create exactly the matrix. What the real broker enforces is
``tests/integration/test_secure_kafka.py``."""

from __future__ import annotations

from podcost.aggregator.settings import DEFAULT_APP_ID
from podcost.annotator.settings import DEFAULT_GROUP
from podcost.ranker.settings import DEFAULT_GROUP as RANKER_GROUP
from podcost_contracts.topics import DEFAULT_TOPICS
from podcost_localinfra.kafka_secure import (
    Acl,
    Layout,
    acl_command_args,
    acl_matrix,
    scram_format_args,
    users,
)

LAYOUT = Layout(clusters=("eu-1", "us-1"))


def test_the_layouts_defaults_are_the_names_the_services_use_by_default() -> None:
    layout = Layout()
    assert (layout.workloads, layout.ranks, layout.costs, layout.deadletter) == (
        DEFAULT_TOPICS.workloads, DEFAULT_TOPICS.ranks, DEFAULT_TOPICS.costs,
        DEFAULT_TOPICS.deadletter,
    )  # fmt: skip
    assert layout.ranker_group_prefix == f"{RANKER_GROUP}-"
    assert layout.aggregator_app_id == DEFAULT_APP_ID
    assert layout.annotator_group == DEFAULT_GROUP


def test_a_principal_may_create_only_topics_it_writes() -> None:
    rules = acl_matrix(LAYOUT)
    created = {(a.principal, a.name, a.pattern) for a in rules if a.operation == "Create"}
    written = {(a.principal, a.name, a.pattern) for a in rules if a.operation == "Write"}
    assert created == written
    assert created == {
        *((f"watcher-{cluster}", "podcost.workloads", "literal") for cluster in LAYOUT.clusters),
        ("ranker", "podcost.ranks", "literal"),
        ("aggregator", "podcost.costs.", "prefixed"),
        ("aggregator", f"{DEFAULT_APP_ID}-", "prefixed"),
        *((user, "podcost.deadletter", "literal") for user in users(LAYOUT)),
    }


def test_each_annotator_reads_only_its_own_clusters_costs_in_its_own_group() -> None:
    for cluster in LAYOUT.clusters:
        reads = {(a.resource, a.name) for a in acl_matrix(LAYOUT)
                 if a.principal == f"annotator-{cluster}" and a.operation == "Read"}  # fmt: skip
        assert reads == {
            ("topic", f"podcost.costs.{cluster}"),
            ("group", f"{DEFAULT_GROUP}.{cluster}"),
        }


def _parsed(argv: list[str]) -> set[Acl]:
    """The ACLs one ``AclCommand --add`` call creates: every operation on every resource."""
    assert argv[0] == "--add"
    pairs = list(zip(argv[1::2], argv[2::2], strict=True))
    principal = next(v for k, v in pairs if k == "--allow-principal").removeprefix("User:")
    pattern = next(v for k, v in pairs if k == "--resource-pattern-type")
    operations = [v for k, v in pairs if k == "--operation"]
    resources = [(k.removeprefix("--"), v) for k, v in pairs if k in ("--topic", "--group")]
    assert ("--allow-host", "*") in pairs
    return {
        Acl(principal, kind, name, op, pattern) for kind, name in resources for op in operations
    }


def test_the_acl_commands_create_exactly_the_matrix_in_few_calls() -> None:
    calls = acl_command_args(acl_matrix(LAYOUT))
    created = [acl for argv in calls for acl in _parsed(argv)]
    assert sorted(created) == acl_matrix(LAYOUT)
    # One JVM start each (about 2.5 s): grouped by principal, pattern type and operations, so
    # 1 per watcher, ranker 3, aggregator 4, and 2 per annotator.
    assert len(calls) == 3 + 4 + 3 * len(LAYOUT.clusters)


def test_every_user_gets_a_scram_credential_at_format_time() -> None:
    assert scram_format_args({"admin": "a1", "ranker": "r2"}) == [
        "--add-scram", "SCRAM-SHA-512=[name=admin,password=a1]",
        "--add-scram", "SCRAM-SHA-512=[name=ranker,password=r2]",
    ]  # fmt: skip
