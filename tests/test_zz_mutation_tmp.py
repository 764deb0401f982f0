import psycopg, pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test
from chaos.harness import install_audit
from worker.db import sql
import test_status_machine as m

@pytest.mark.parametrize("stmt,old,new", [
    ("RECORD_OUTCOMES", "WHERE j.id = r.id AND j.status = 'processing' AND j.worker_id = %(worker_id)s", "WHERE j.id = r.id AND j.worker_id = %(worker_id)s"),
    ("RECORD_OUTCOMES", "AND j.worker_id = %(worker_id)s\n", "\n"),
    ("CANCEL", "WHERE j.id = t.id AND t.status IN ('pending', 'paused', 'processing')", "WHERE j.id = t.id"),
    ("RETRY", "WHERE id = %(id)s AND status IN ('failed', 'cancelled')", "WHERE id = %(id)s"),
    ("RESUME", "WHERE id = %(id)s AND status = 'paused'", "WHERE id = %(id)s"),
    ("RESCUE", "WHERE j.status = 'processing'\n", "WHERE true\n"),
    ("RELEASE", "WHERE status = 'processing' AND", "WHERE"),
])
def test_mutant(database_url, monkeypatch, stmt, old, new):
    text = getattr(sql, stmt)
    assert old in text
    monkeypatch.setattr(sql, stmt, text.replace(old, new))
    install_audit(database_url)
    with psycopg.connect(database_url, autocommit=True) as conn:
        m.JobLifecycle.conn = conn
        with pytest.raises(AssertionError) as e:
            run_state_machine_as_test(m.JobLifecycle, settings=settings(max_examples=100, stateful_step_count=50, deadline=None, database=None, phases=[Phase.generate], suppress_health_check=[HealthCheck.too_slow]))
    print("\nCAUGHT", stmt, "->", str(e.value).splitlines()[0][:150])
