-- How large each published shift is, in one vocabulary across families (docs/shift_magnitudes.md):
-- BREEDS hierarchy distances, MetaShift spectral distances, ConDS TV distance.
SELECT family, benchmark, measure, round(value, 3) AS value
FROM shift_magnitudes
WHERE scope = 'all'
ORDER BY family, measure, value DESC;
