-- Living-17: the subpopulations of each superclass in the source and the target domain.
SELECT y, superclass_name, domain, string_agg(subclass_name, '; ' ORDER BY rank) AS subclasses
FROM breeds_subpopulations
WHERE benchmark = 'living17'
GROUP BY ALL
ORDER BY y, domain DESC;
