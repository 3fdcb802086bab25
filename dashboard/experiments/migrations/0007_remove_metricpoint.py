"""MetricPoint goes: every reader uses SeriesPoint (0006 copied the points in).

Going back rebuilds MetricPoint rows from the series: one row per (run, step) of the four
figures a point carried. Train loss and images/s make a step point; test loss and accuracy an
epoch point (the epoch's images/s came from the epoch/images_per_second series). What a
MetricPoint had and a series has not is made up plainly: seq counts the rows of a run in step
order, epoch is 0.
"""

from django.db import migrations

STEP_KEYS = {"train_loss": "train_loss", "images_per_second": "images_per_second"}
EPOCH_KEYS = {
    "test_loss": "test_loss",
    "test_accuracy": "test_accuracy",
    "epoch/images_per_second": "images_per_second",
}
BATCH = 5000


def _rows(SeriesPoint, keys):
    """{(run, step): {field: value, "time": t}} of these series."""
    rows = {}
    points = SeriesPoint.objects.filter(key__in=list(keys)).order_by("experiment_id", "step", "id")
    for run, key, step, time, value in points.values_list(
        "experiment_id", "key", "step", "time", "value"
    ).iterator():
        row = rows.setdefault((run, step), {"time": time})
        row[keys[key]] = value
    return rows


def series_to_points(apps, schema_editor):
    SeriesPoint = apps.get_model("experiments", "SeriesPoint")
    MetricPoint = apps.get_model("experiments", "MetricPoint")
    both = [(key, row, False) for key, row in _rows(SeriesPoint, STEP_KEYS).items()]
    both += [(key, row, True) for key, row in _rows(SeriesPoint, EPOCH_KEYS).items()]
    both.sort(key=lambda item: (item[0], item[2]))  # a step's epoch point after its step point
    seqs, points = {}, []
    for (run, step), row, _ in both:
        seqs[run] = seqs.get(run, 0) + 1
        points.append(MetricPoint(experiment_id=run, seq=seqs[run], step=step, epoch=0, **row))
        if len(points) >= BATCH:
            MetricPoint.objects.bulk_create(points)
            points = []
    MetricPoint.objects.bulk_create(points)


class Migration(migrations.Migration):
    dependencies = [("experiments", "0006_series_logs_by_rank_tags")]

    operations = [
        # Going back: the table comes back empty (the next operation's reverse), then this
        # operation's reverse fills it.
        migrations.RunPython(migrations.RunPython.noop, series_to_points),
        migrations.DeleteModel(name="MetricPoint"),
    ]
