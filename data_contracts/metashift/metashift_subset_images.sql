-- metashift_subset_images: the images of every selected subset, as a view.
-- A collection stores the annotations its selected subsets are made of, integer-coded (metashift_scene_*), never one
-- row per (subset, image): an image is in class(context) when an object name of the class shows in it
-- (metashift_scene_class_names) and it has the context (metashift_scene_objects: an object name;
-- metashift_scene_contexts: an image-level context; metashift_scene_attributes: an attribute of an object of the
-- class). Subsets and codes meet through metashift_scene_vocabulary (class and context strings).
-- {{stored}} is the union of the versions that store the table (written before it became a view, listing every
-- candidate subset); {{stored_versions}} lists them as 'benchmark/version'.

CREATE OR REPLACE VIEW metashift_subset_images_history AS
WITH
selected AS (
    SELECT s.benchmark, s.version, s.subset, s.context_kind, c.code AS class_code, x.code AS context_code
    FROM metashift_subsets_history AS s
    INNER JOIN metashift_scene_vocabulary_history AS c
        ON c.benchmark = s.benchmark AND c.version = s.version AND c.value = s.class
    INNER JOIN metashift_scene_vocabulary_history AS x
        ON x.benchmark = s.benchmark AND x.version = s.version AND x.value = s.context
    WHERE s.selected AND s.benchmark || '/' || s.version NOT IN ({{stored_versions}})
),
shows AS (
    SELECT DISTINCT o.benchmark, o.version, n.class, o.image
    FROM metashift_scene_objects_history AS o
    INNER JOIN metashift_scene_class_names_history AS n
        ON n.benchmark = o.benchmark AND n.version = o.version AND n.name = o.name
),
-- (class, context, image) first, then the selected subsets by (class, context): a whole collection's 12.9 M
-- memberships in about 1 s at GQA scale, one subset in 0.5 s (joining a subset to every image with its context
-- first took minutes: a context is shared by the subsets of many classes)
object_triples AS (
    SELECT c.benchmark, c.version, c.class, x.name AS context, c.image
    FROM shows AS c
    INNER JOIN metashift_scene_objects_history AS x
        ON x.benchmark = c.benchmark AND x.version = c.version AND x.image = c.image
),
general_triples AS (
    SELECT c.benchmark, c.version, c.class, x.context, c.image
    FROM shows AS c
    INNER JOIN metashift_scene_contexts_history AS x
        ON x.benchmark = c.benchmark AND x.version = c.version AND x.image = c.image
),
members AS (
    SELECT s.benchmark, s.version, s.subset, t.image
    FROM object_triples AS t
    INNER JOIN selected AS s
        ON s.benchmark = t.benchmark AND s.version = t.version AND s.class_code = t.class
        AND s.context_code = t.context AND s.context_kind = 'object'
    UNION ALL
    SELECT s.benchmark, s.version, s.subset, t.image
    FROM general_triples AS t
    INNER JOIN selected AS s
        ON s.benchmark = t.benchmark AND s.version = t.version AND s.class_code = t.class
        AND s.context_code = t.context AND s.context_kind = 'general'
    UNION ALL
    SELECT s.benchmark, s.version, s.subset, a.image
    FROM selected AS s
    INNER JOIN metashift_scene_attributes_history AS a
        ON a.benchmark = s.benchmark AND a.version = s.version AND a.class = s.class_code
        AND a.attribute = s.context_code
    WHERE s.context_kind = 'attribute'
)
SELECT t.benchmark, t.version, t.subset, t.image_id
FROM {{stored}} AS t
SEMI JOIN publications AS p ON p.benchmark = t.benchmark AND p.version = t.version
UNION ALL
SELECT m.benchmark, m.version, m.subset, i.image_id
FROM members AS m
INNER JOIN metashift_scene_images_history AS i
    ON i.benchmark = m.benchmark AND i.version = m.version AND i.image = m.image;

CREATE OR REPLACE VIEW metashift_subset_images AS
SELECT t.*
FROM metashift_subset_images_history AS t
SEMI JOIN latest_versions AS l ON l.benchmark = t.benchmark AND l.version = t.version;
